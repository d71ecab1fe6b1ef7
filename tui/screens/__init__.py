"""The chat app's modal screens, one a file: the model picker, the conversation list,
settings, and the small dialogs."""

from localinfer.tui.screens.confirm import ConfirmScreen
from localinfer.tui.screens.conversation_list import ConversationDeleted, ConversationList
from localinfer.tui.screens.model_picker import ModelPicker
from localinfer.tui.screens.settings import SettingsScreen
from localinfer.tui.screens.text_prompt import TextPrompt

__all__ = ["ConfirmScreen", "ConversationDeleted", "ConversationList", "ModelPicker",
           "SettingsScreen", "TextPrompt"]
