"""Retrieval over the vectors a corpus job wrote: a LanceDB table and its search (`index`),
exact search over the shards and retrieval scored in BEIR's layout (`beir`)."""
