"""Stateful mock apps (Gmail, Notion, Slack, Canvas) under one simulated clock; see world.py."""

from envs.apps.base import ToolError, ToolSchema
from envs.apps.world import APPS, Change, Event, World, app_tools, diff

__all__ = ["APPS", "Change", "Event", "ToolError", "ToolSchema", "World", "app_tools", "diff"]
