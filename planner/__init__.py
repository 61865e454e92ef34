"""SQL front end and planning: parse, bind AI functions, rewrite, and emit a physical plan."""
