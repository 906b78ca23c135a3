"""Shared test helpers, imported as `support.<name>` from any test directory (pyproject puts tests/ on
sys.path): the suite's fixtures that are plain modules, not conftest fixtures."""
