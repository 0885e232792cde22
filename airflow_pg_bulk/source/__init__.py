"""source: find, inspect, cut and read the input; never a database."""
