"""After results: the regression gate (compare) and the rollout playbook."""
