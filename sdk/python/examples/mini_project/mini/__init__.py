"""A small workerpool project in Python: a producer and a worker with two tasks."""
