"""db: one DB-API connection, either driver: the driver layer, sessions, error translation."""
