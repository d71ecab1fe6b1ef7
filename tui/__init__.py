"""The Textual chat app. Not built yet: see the TUI issue."""
