"""The user's speech on the audio side: voice activity and the end-of-turn model, both small ONNX models on CPU.

    silero.py       Silero VAD (the weights faster-whisper ships), one shared model, a small state per session
    endpoint.py     16 kHz audio → SpeechStart / SpeechEnd events (the Endpointer protocol)
    end_of_turn.py  Smart Turn v3.2: does the speech sound finished? (weights shipped in ``data/``)
    onnx.py         one CPU onnxruntime session per model, shared by every session of the process

What a turn's end means is decided in ``pipeline.end_of_turn``; this package only gives the audio's evidence.
"""
