"""The operator console's browser files, shipped as package data and served by the API."""
