"""Request and response models, one module per resource, named by direction."""
