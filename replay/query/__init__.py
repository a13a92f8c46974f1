"""The query layer, the only DuckDB importer: the gateway (connection, views, errors), the
derived views, the invariant catalog (`invariants/*.sql`) and the checker."""
