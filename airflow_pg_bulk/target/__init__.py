"""target: the target table, and every way staged rows become its rows."""
