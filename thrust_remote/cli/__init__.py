"""The typer CLI: one module per command (or group), registered in main.py."""
