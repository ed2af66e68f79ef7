"""`specllama chat`: a conversation that stays fast however long it gets."""

from .command import chat_command
from .repl import ChatREPL
from .session import ChatSession, HistoryTrimmed, parse_setting

__all__ = ["ChatREPL", "ChatSession", "HistoryTrimmed", "chat_command", "parse_setting"]
