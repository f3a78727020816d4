"""Wrong implementations, each with the hint its check must give: every check must catch one."""
