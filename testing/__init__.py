"""The pytest plugin (docs/pytest-plugin.md): every vLLM Scheduler a test creates recorded and
checked with the catalog at the end of the test."""
