"""Text, Markdown, JSON and HTML renderings of results."""
