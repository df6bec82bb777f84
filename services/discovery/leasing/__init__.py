"""Leases from request to end: acquiring (with quota, refusals and waiting), renewing, reporting,
rotating, releasing, expiring and revoking, and the demand a refused request leaves for the
pools.
"""
