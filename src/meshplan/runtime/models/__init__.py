"""Reference models the runtime trains, built from the same ModelSpec the cost model reads."""
