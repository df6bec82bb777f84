"""Discovery's metrics (the API's, the fleet's gauges, per selector size) and its server spans."""
