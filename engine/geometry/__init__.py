"""Where a model can run on a GPU: the MIG catalogue, layouts with their validator, mig-parted YAML and
the data plane's slot names. Rule: depends on nothing else in the engine."""
