"""The provider's notifiers: :mod:`.alerts` (webhook, email, the router to any notifier, the
deadline callback)."""
