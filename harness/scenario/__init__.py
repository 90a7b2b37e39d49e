"""Stage 1, the scenario: the validated, frozen description of one experiment and its loading."""
