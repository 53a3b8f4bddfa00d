"""Components of one's own beside the built-ins: looked up by name (built-in, registered, or an installed package's
entry point) or by import path (package.module:Name), with one-line errors for each way that fails."""
