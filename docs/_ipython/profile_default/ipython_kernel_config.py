# The IPython profile of the documentation build's notebook kernels (docs/conf.py sets
# IPYTHONDIR here): kernel log messages below errors stay out of the build log.
c = get_config()  # noqa: F821 - IPython's config loader defines it
c.IPKernelApp.log_level = 'ERROR'
# tqdm.auto, imported in a kernel without ipywidgets, warns that it falls back to the
# text progress bar (with the warning's site-packages path); the build shows no bars.
c.InteractiveShellApp.exec_lines = [
  "import warnings; warnings.filterwarnings('ignore', message='IProgress not found')",
]
