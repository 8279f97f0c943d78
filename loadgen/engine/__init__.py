"""Engine: sends every plan at its time over a lean HTTP/1.1 client; each becomes one record."""
