(function () {
"use strict";
var m = document.querySelector('meta[name="tally-challenge"]'), st = document.getElementById("tally-status");
if (!m) return;
var c = m.content, d = +m.getAttribute("data-difficulty"), act = m.getAttribute("data-action");
var K = [], H0 = [];
for (var p = 2, k = 0; k < 64; p++) {
	for (var q = 2; q * q <= p && p % q; q++);
	if (q * q > p) {
		if (k < 8) H0[k] = Math.pow(p, 1 / 2) * 4294967296 | 0;
		K[k++] = Math.pow(p, 1 / 3) * 4294967296 | 0;
	}
}
// SHA-256 of bytes, where crypto.subtle is missing (not a secure context).
function sha(b) {
	var l = b.length, n = (l + 72 >> 6) << 4, w = new Int32Array(n), W = new Int32Array(64), H = H0.slice(), i, j;
	for (i = 0; i < l; i++) w[i >> 2] |= b[i] << (24 - 8 * (i & 3));
	w[l >> 2] |= 0x80 << (24 - 8 * (l & 3));
	w[n - 1] = l * 8;
	for (i = 0; i < n; i += 16) {
		var a = H[0], bb = H[1], cc = H[2], dd = H[3], e = H[4], f = H[5], g = H[6], h = H[7];
		for (j = 0; j < 64; j++) {
			if (j < 16) W[j] = w[i + j];
			else {
				var x = W[j - 15], y = W[j - 2];
				W[j] = ((x >>> 7 | x << 25) ^ (x >>> 18 | x << 14) ^ (x >>> 3)) + ((y >>> 17 | y << 15) ^ (y >>> 19 | y << 13) ^ (y >>> 10)) + W[j - 7] + W[j - 16] | 0;
			}
			var t1 = h + ((e >>> 6 | e << 26) ^ (e >>> 11 | e << 21) ^ (e >>> 25 | e << 7)) + (e & f ^ ~e & g) + K[j] + W[j] | 0;
			var t2 = ((a >>> 2 | a << 30) ^ (a >>> 13 | a << 19) ^ (a >>> 22 | a << 10)) + (a & bb ^ a & cc ^ bb & cc) | 0;
			h = g; g = f; f = e; e = dd + t1 | 0; dd = cc; cc = bb; bb = a; a = t1 + t2 | 0;
		}
		H[0] = H[0] + a | 0; H[1] = H[1] + bb | 0; H[2] = H[2] + cc | 0; H[3] = H[3] + dd | 0;
		H[4] = H[4] + e | 0; H[5] = H[5] + f | 0; H[6] = H[6] + g | 0; H[7] = H[7] + h | 0;
	}
	var o = new Uint8Array(32);
	for (i = 0; i < 32; i++) o[i] = H[i >> 2] >>> (24 - 8 * (i & 3)) & 255;
	return o;
}
function zeros(h) {
	for (var i = 0; i < d; i++) if ((i & 1 ? h[i >> 1] & 15 : h[i >> 1] >> 4) !== 0) return false;
	return true;
}
var enc = new TextEncoder(), sub = window.isSecureContext && window.crypto && crypto.subtle, t0 = Date.now();
async function run() {
	for (var n = 0; ; n++) {
		var b = enc.encode(c + n), h = sub ? new Uint8Array(await sub.digest("SHA-256", b)) : sha(b);
		if (zeros(h)) break;
		if (n % 4096 === 4095) {
			st.textContent = "Working: " + (n + 1) + " tries so far.";
			await new Promise(function (r) { setTimeout(r, 0); });
		}
	}
	var f = document.createElement("form");
	f.method = "POST";
	f.action = act;
	[["challenge", c], ["nonce", "" + n], ["elapsed_ms", "" + (Date.now() - t0)], ["return", location.pathname + location.search]].forEach(function (kv) {
		var i = document.createElement("input");
		i.type = "hidden"; i.name = kv[0]; i.value = kv[1];
		f.appendChild(i);
	});
	document.body.appendChild(f);
	st.textContent = "Done, going back to the page.";
	f.submit();
}
run().catch(function (e) { st.textContent = "The check failed: " + e; });
})();
