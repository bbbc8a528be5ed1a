"""Where engine profiles come from: measured (`qlm profile`), derived from public figures, or
packaged; and how they are stored. README.md here says which file answers what. Import from
the modules."""
