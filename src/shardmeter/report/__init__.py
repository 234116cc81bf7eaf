"""Views of estimates and search results: terminal tables, JSON documents and plot files."""
