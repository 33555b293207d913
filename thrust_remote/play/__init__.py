"""The browser demo: serve.py serves web/ and the models it can play."""

# The envs the page (web/src/snake.js) can play; other models are listed but marked not playable. Here,
# not in serve.py, so that `train` and the CLI's start do without the page's HTTP server.
PLAYABLE_ENVS = ("snake",)
