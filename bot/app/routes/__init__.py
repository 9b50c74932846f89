"""HTTP routing: the bot's endpoints (endpoints.py) and request bodies read with a ceiling
(request_body.py); ``bot.app.server`` composes the bot around them."""
