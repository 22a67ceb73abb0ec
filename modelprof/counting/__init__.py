"""The static cost: module hooks say which call runs (``scope``), an op-level dispatch mode
charges every op to it (``counter``), ``forward`` runs the one counted forward, and
``formulas`` is the one registry of per-op costs."""
