"""Model store: where models come from (embedded packages, local paths) and what they hold."""
