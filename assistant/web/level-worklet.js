// Reports, per 128-sample block, whether each input is above its level threshold, stamped with the
// AudioContext clock (currentTime): input 0 = microphone, input 1 = the bot's reply.
// The page turns these into voice-to-voice latency on one clock. The mic is judged by RMS (the rule the
// speech manifests and the server's speech end use), the reply by peak (the bench client's rule).
class LevelProbe extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    this.micThreshold = Math.pow(10, (o.micDbfs ?? -45) / 20);
    this.botThreshold = Math.pow(10, (o.botDbfs ?? -40) / 20);
    this.micPeak = 0; this.botPeak = 0; this.blocks = 0;
  }
  process(inputs) {
    const t = currentTime;
    const peak = (input) => {
      let p = 0;
      if (!input) return 0;
      for (const ch of input) for (let i = 0; i < ch.length; i++) { const a = Math.abs(ch[i]); if (a > p) p = a; }
      return p;
    };
    const rms = (input) => {
      if (!input || !input.length || !input[0].length) return 0;
      let s = 0;
      for (const v of input[0]) s += v * v;
      return Math.sqrt(s / input[0].length);
    };
    const mic = peak(inputs[0]);
    const bot = peak(inputs[1]);
    if (rms(inputs[0]) >= this.micThreshold) this.port.postMessage({ kind: 'mic', t });
    if (bot >= this.botThreshold) this.port.postMessage({ kind: 'bot', t });
    this.micPeak = Math.max(this.micPeak, mic); this.botPeak = Math.max(this.botPeak, bot);
    if (++this.blocks % 8 === 0) {  // ~21 ms at 48 kHz
      this.port.postMessage({ kind: 'levels', mic: this.micPeak, bot: this.botPeak });
      this.micPeak = 0; this.botPeak = 0;
    }
    return true;
  }
}
registerProcessor('level-probe', LevelProbe);
