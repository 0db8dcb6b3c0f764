"""Control-plane core: settings, stores, services. Packaged by Chalice with app.py."""
