"""The pure core's shared vocabulary: no database, HTTP, scheduler, settings or clock."""
