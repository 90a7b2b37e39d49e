"""Bundled scenarios, shipped as package data so `kvbench run quickstart` works after install."""
