"""Keys shared by the request layer and the mask library for custom (grammar) tools; imports nothing."""

CUSTOM_KEY = "custom_format"  # the tool dict's key holding the custom tool's format
INPUT = "input"  # the one parameter a custom tool is shown with
