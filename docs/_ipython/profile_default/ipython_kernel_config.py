# The IPython profile of the documentation build's notebook kernels (docs/conf.py sets
# IPYTHONDIR here): kernel log messages below errors stay out of the build log.
c = get_config()  # noqa: F821 - IPython's config loader defines it
c.IPKernelApp.log_level = 'ERROR'
