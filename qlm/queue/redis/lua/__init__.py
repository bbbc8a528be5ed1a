"""The Lua scripts of the Redis queue (qlm/queue/redis/queue.py), one per state change."""
