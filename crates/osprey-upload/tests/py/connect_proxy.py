"""An HTTP CONNECT proxy on loopback for the proxy tests: prints
`CONNECT host:port` per tunnel, then relays bytes both ways. Prints its
port first."""
import socket
import socketserver
import sys
import threading


class Tunnel(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if len(line) < 2 or line[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        print(f"CONNECT {line[1]}", flush=True)
        host, port = line[1].rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()

        def pump(a, b):
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                b.close()

        threading.Thread(target=pump, args=(upstream, self.connection), daemon=True).start()
        pump(self.connection, upstream)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


server = Server(("127.0.0.1", 0), Tunnel)
print(server.server_address[1], flush=True)
sys.stdout.flush()
server.serve_forever()
