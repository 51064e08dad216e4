"""The one OTLP codec: how rankscope's data travels, encoded by the SDK and decoded by the sink.

``common`` (attributes, resources, steps), ``metrics`` (reduce states as metric points),
``markers`` (a process closed a step; a process is done), ``logs`` (streamed raw values) and
``spans`` (span records). Decoding is checked: a point that does not match its reduce type's
state comes back as the reason it is refused, never as an exception.
"""
