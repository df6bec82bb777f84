"""The event log for people: ``events``, ``streams``, ``streams check`` and time travel
(``--at``/``--until``).
"""
