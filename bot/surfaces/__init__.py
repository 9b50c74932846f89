"""Where people read and act: the Slack app and the read-only incident page.

slack/   the bolt app, its listeners and Block Kit views, and the console that stands in for it
web/     the incident page behind signed links (Jinja templates in bot/templates/web)
"""
