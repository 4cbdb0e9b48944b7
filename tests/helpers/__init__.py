"""Programs the tests run in child processes."""
