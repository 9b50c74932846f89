"""What every room stands on; nothing here imports a room above it.

chat/          Slack's wire format every room that writes to a thread shares
numbers/       what a number is (a value or a histogram bound) and the one way it is written
store/         SQLAlchemy models, migrations, and the persistence the rooms share
runtime/       plumbing: supervised tasks, the bot's metrics, ids, the SSE parser, defaults
listening.py   binding a listening socket
config.py      settings (TOML and environment), validated by pydantic
errors.py      the error tree every room raises, each error with what to do
"""
