"""The durable agent engine: a pure machine, its Redis store, and the shell that runs effects."""
