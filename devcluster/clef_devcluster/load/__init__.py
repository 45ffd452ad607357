"""The operator at scale (`make load-test`); see __main__ and scale."""
