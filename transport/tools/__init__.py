"""Command-line tools: transport-schema, transport-conformance."""
