"""The scheduling core: jobs, decisions, protocols. Knows nothing of sim vs live."""
