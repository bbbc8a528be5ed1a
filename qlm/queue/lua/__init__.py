"""The Lua scripts of the Redis queue (qlm/queue/redis_queue.py), one per state change."""
