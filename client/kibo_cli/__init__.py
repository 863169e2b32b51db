"""kibo: the command line for kibo workspaces."""
