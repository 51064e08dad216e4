"""Framework adapters, one module (or package) per framework: each maps the framework's own
logging, steps and phases onto rankscope's calls, imports the framework itself, and is reached by
users through the code-free facade of the same name at the package root (``rankscope.lightning``,
``rankscope.verl``, ...). ``stepping`` is the step follower they share."""
