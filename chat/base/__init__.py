"""The ground floor of the gateway: what every room of `chat` uses, importing none of them.

`metrics` (the counters), `agents` (the configured agents, built once into typed configs),
`db` (ORM work from async code: readers, the writer) and `availability` (is the database, is
the layer there), `health` (this process's background loops).
"""
