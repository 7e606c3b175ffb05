"""Example transforms named by pipeline specs (``module:function``, see kafka_eos.transforms)."""
