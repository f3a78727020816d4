"""Second, differently written correct solutions: every check must give them full marks."""
