"""The NATS side of every service: the client, the connection and whom it logs in as, the durable
consumer loop, and the embedded nats-server with its users and credentials.
"""
