"""Generated schema modules (`transport-schema compile schema/*.toml`). Do not edit."""
